"""Byte formats that wdsmp reads and writes, without any I/O of their own.

``tar`` holds the tar format's facts and the cold paths that the native splitter and its twin
share (headers, pax records, size limits); ``encoders`` turns sample fields into bytes by
extension, as the writers do; ``samplecodec`` stores samples without pickle for the sample
caches. Used by the tar readers, the writers and the caches.
"""
