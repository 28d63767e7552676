"""Reading a recipe: YAML and JSON text, the input bounds every value obeys, command-line
overrides, the schema of the fixed sections and its error texts, and `normalize`, which
runs the per-section checks in order and gives the normalized recipe.
"""
