"""eorouter benchmark: `scripts/bench` (python -m bench.run), C clients built by eorouter_tools.build."""
