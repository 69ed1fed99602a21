"""The whole Anemoi model, as anemoi-training builds it from its default graph-transformer config."""
