"""Tools around the router, not the router: launching routers and networks on
loopback (launcher, topology), the demos, and building the C client programs the
benchmarks and interop peers use. Tests, benchmarks and scripts use them; the router
package never imports them (its command line finds their commands through the
``eorouter.commands`` entry points: eorouter_tools/commands.py)."""
