"""Running Tocsin on a laptop: the embedded runtime on moto, a webhook receiver, the demo."""
