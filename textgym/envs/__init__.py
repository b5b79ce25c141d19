"""Native text environments and presets for Gymnasium's classic envs."""
