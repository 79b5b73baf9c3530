"""Clock-offset estimates against planted offsets on a loopback fleet (``python -m benchmarks.clock``)."""
