"""Template-free search (Ansor): sketches, annotation, evolution, cost model, measurement, records."""
