"""Code that runs inside the inner-job pod image: it imports pydantic, fsspec and the standard library only, nothing of the server side."""
