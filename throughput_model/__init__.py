"""throughput_model package."""
