"""What the worker image carries: the MoE-LoRA trainer and its experts backend. Imports no Django."""
