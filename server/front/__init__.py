"""The public front of `hub-vit serve`: the HTTP and gRPC gates on the public ports, which refuse what Triton 2.51
cannot take safely and relay the rest to Triton's private loopback ports.
"""
