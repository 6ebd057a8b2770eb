"""Layer 4: the contract in NCCL worlds, one GPU per rank (marked ``gpu``).

Run on a GPU host with::

    pytest -m gpu -ra

``-ra`` lists every skip with its reason: a world larger than the visible GPUs
is skipped ("an NCCL world of 8 needs 8 GPUs, 2 visible"), and without CUDA
every test here is skipped ("CUDA is not available"), so on a CPU runner these
tests never fail. Keep ``-n`` off or use ``-n auto --dist loadgroup`` (each
world size stays in one worker, so two workers never share the GPUs).
"""
