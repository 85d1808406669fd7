"""What the command line (``python -m gateway``) shows people, apart from serving."""
