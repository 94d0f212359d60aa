"""The shipped search spaces, one per trainer (<trainer>.yaml); installed as the package ``tuner.search_spaces``."""
