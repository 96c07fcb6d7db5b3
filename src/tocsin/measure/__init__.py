"""What runs on the embedded runtime to judge Tocsin: the demo, the benchmark, the chaos
suite, the cold start, the costs, and the receiver that times each webhook's arrival."""
