"""PyTorch modules: the PyG-compatible GraphTransformerConv and its PyG reference."""
