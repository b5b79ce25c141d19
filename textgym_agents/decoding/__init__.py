"""Decoding and scoring replies.

Free-text generation, choices, grammar-constrained replies, and scoring replies (log-probs,
values, entropies) on a shared prompt prefix.
"""
