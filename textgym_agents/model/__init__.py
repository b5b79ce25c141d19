"""The model and its numerics.

Loading, precision, attention, LoRA adapters, gradient checkpointing and returning freed
memory to the OS.
"""
