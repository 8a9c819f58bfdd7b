"""Built-in demonstration tasks (tiny models, datasets and rewards made in code, so a run needs no
hub): kept out of the pure floors because they write files and train warm-ups."""
