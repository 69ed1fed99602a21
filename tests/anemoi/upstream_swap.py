"""A pytest plugin for Anemoi's own test files (tests/anemoi/test_upstream.py): loaded before they are collected,
it puts gtnorm.anemoi's drop-ins where anemoi-models' modules define the graph-transformer block, processor and
mapper classes, so that those files' ``from anemoi.models.layers... import ...`` get the drop-ins."""

from anemoi.models.layers import block, mapper, processor

import gtnorm.anemoi

block.GraphTransformerProcessorBlock = gtnorm.anemoi.GraphTransformerProcessorBlock
block.GraphTransformerMapperBlock = gtnorm.anemoi.GraphTransformerMapperBlock
processor.GraphTransformerProcessor = gtnorm.anemoi.GraphTransformerProcessor
mapper.GraphTransformerForwardMapper = gtnorm.anemoi.GraphTransformerForwardMapper
mapper.GraphTransformerBackwardMapper = gtnorm.anemoi.GraphTransformerBackwardMapper
