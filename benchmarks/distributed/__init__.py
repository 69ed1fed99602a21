"""gtnorm's Anemoi drop-ins on several GPUs under Anemoi's model sharding (see run.py)."""
