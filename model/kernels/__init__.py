"""Our compiled CPU kernels: their sources (csrc/), their build, their tuning."""
