"""Peer implementations of the benchmarked work, one module per provider.

Each is written the way a user of that tool would write it: eager NumPy with a hand-derived
backward, PyTorch eager and torch.compile with autograd, JAX jit with value_and_grad, numba
@njit with hand-fused loops. None of them imports tilegen.
"""
