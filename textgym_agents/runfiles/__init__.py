"""Run files.

Checkpoints, saved policies, state files, integrity manifests, the run lock and atomic
writes.
"""
