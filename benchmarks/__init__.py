"""Side-by-side measurements of gpulanes against plain Celery; each module runs as a script."""
