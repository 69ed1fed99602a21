"""gtnorm's benchmarks, a folder per question (``python -m benchmarks.<folder>``; each folder's run.py says how):

- graphs/       the bare op on Anemoi's graphs: speed, memory and accuracy of every variant (`bash run.sh bench`);
                on a CPU its quick mode (graphs/quick.py) checks the kernels through the Triton interpreter
- kernels/      the kernels from inside: launch plans, profiles, shared memory, host time per call
- anemoi/       gtnorm's drop-ins inside Anemoi's own blocks, against Anemoi's Triton backend
- model/        the whole Anemoi model as anemoi-training builds it, a training step and inference
- distributed/  the drop-ins on several GPUs under Anemoi's model sharding

At the top: report.py (the README's and the docs' tables from the committed results/), results_date.py (their
dates), peer_kernels.py (kernels of others, loaded from where the user points); NOTES.md, the dated kernel log.
"""
