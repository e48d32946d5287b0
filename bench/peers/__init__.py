"""Side-by-side benchmarks of duetime and other Redis task queues; see run.py."""
