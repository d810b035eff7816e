"""What a step costs: the step cost model, the parallel link model."""
