"""NeMo AutoModel's spellings translated to tuneyard's: whole sections (accepted, ignored
with a warning, or refused at the field), value forms, and blocks read from another place.
"""
