"""circuitlab: build, train, load and take apart transformer language models."""
__version__ = "0.1.0"
