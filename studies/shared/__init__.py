"""What two or more jobs need: prompt suites, tree specs, the run-folder format, timed decoding rows,
the data folder and the commands' common helpers. Nothing here imports a job."""
