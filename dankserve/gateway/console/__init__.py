"""The web console at /ui/ on the gateway's listener (docs/CONSOLE.md).

The page is static HTML, CSS and plain JS shipped in the package (`static/`: no build chain, no
CDN); its data comes from JSON routes under /ui/api/ that read the very documents the CLI prints:
`status --json` (the daemon's control verb table, handed in as `Control`) and `usage`
(`gateway.usage.usage_rows` over the gateway's own counters). The gateway still reaches the daemon
only through what `start_gateway` is given: this package imports nothing from the supervisor.
"""
