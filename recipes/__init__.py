"""Example recipes, their models (recipes/models) and what makes them; not part of the installed aotc."""
