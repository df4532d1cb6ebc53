"""Workloads and the side-by-side policy comparison behind ``radixflow bench``."""
