"""App: wiring above the plug-ins: config, simulate, cluster, sizing, sweeps, results and reports."""
