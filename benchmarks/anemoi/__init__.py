"""gtnorm inside Anemoi's own blocks: anemoi-models' Triton backend against gtnorm.anemoi's drop-ins."""
