"""The ranks' side: what runs in each rank process (an ipyparallel engine, or an exported batch job's rank) and in
the helpers the kernel starts on the nodes. Nothing here imports ``jupyter_hpcai.engines`` (the kernel's side).

- ``boot``: what a rank runs first (pin, network, the framework in a thread, then the engine);
- ``identity``: a rank's number, host and GPU from the launcher's variables, and pinning;
- ``calls``: what the kernel calls on a rank (rank info, framework init, the cell);
- ``frameworks``: Horovod and torch.distributed (a rank's init; the rendezvous the kernel computes);
- ``continuity``: ``hpc`` on the ranks: walltime hooks, ``Checkpoint``, restore;
- ``telemetry``: each rank's sampler and its file (read by the kernel and the server extension);
- ``stacks``: a node's helper that dumps the ranks' stacks (py-spy), and their grouping for the kernel;
- ``selfstacks``: a rank's own thread that answers stack requests where py-spy cannot attach;
- ``batch``: an exported job's ranks (export.py writes the job);
- ``local``: the local launcher's helper, which starts the ranks of this machine without MPI.
"""
