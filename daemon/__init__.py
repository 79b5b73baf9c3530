"""The servetune daemon: runs leased trials on one node (vLLM server lifecycle + load generator).

Entry point: the ``daemon`` console script (``daemon start --coordinator tcp://HOST:PORT``), or
``python -m daemon``. It never imports vLLM itself; vLLM runs as a child process.
"""
