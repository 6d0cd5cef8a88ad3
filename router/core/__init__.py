"""The pure core: every routing decision, no proton, sockets, threads, files or clock."""
