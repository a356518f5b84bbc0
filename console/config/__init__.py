"""What the operator gives: inventories (YAML, Slurm allocations), checked values and paths."""
