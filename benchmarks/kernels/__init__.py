"""The kernels from inside, for whoever changes them: launch-plan sweeps (kernel_sweep), Nsight Compute runs
(profile_kernels), shared memory and registers per plan (shared_memory), host time per call (host_time, call_path),
LayerNorm against RMSNorm kernel by kernel (layernorm_kernels), the fused edge projection (edge_projection). What
they found is in benchmarks/NOTES.md."""
