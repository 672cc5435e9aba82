"""Bench: policies side by side with plain decoding and HF assisted generation; decode and latency."""
