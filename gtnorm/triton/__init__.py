"""The graph-transformer attention kernels (forward, backward) with RMSNorm fused into the Q/K loads."""
