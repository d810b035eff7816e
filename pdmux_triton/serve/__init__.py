"""The serving loops, their executor contract, metrics, the router and the simulated executor."""
