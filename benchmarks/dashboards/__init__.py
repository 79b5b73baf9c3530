"""Dashboard render benchmark: the experiments page and the Pareto explorer on 100,000 trials."""
