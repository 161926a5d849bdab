"""GPU step profiling in plain PyTorch, the measurements behind the twin's measured profiles.

`gpu_profile` times a decode/verify step per batch size and depth (and a step with a
newcomer, `--mixed`) on a target and EAGLE-3 head of a model's shape with random
weights, in CUDA graphs; `gpu_pieces` times a step mixing k = 0 and drafting requests
both in one graph and piecewise. Their outputs become `bench/twin/profiles/` and the
profiles' `mixed_step` tables (`bench.twin.mixed_step`); both run on the CPU with
`--tiny` (the tests' size). The twin itself needs no torch.
"""
