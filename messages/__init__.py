"""Wire schemas (msgspec Structs), codecs and Kafka header conventions. Imports msgspec only.

`admission`, `errors`, `error_codes` and `limits` import the standard library alone: `gpu/`
imports them, and runs where msgspec is not installed.
"""
