"""The wiring: the Faust app, the one composition root, the agents and background services."""
