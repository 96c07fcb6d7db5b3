"""The embedded runtime: Tocsin's template, state machine and handlers on moto, on a laptop
(`tocsin serve`, the tests). What measures Tocsin on it is in `tocsin.measure`."""
