"""The report's sections, one module per family; each section is a function of the run's
`bench.systems.Bench` returning the figures its report section shows (see bench/run.py)."""
