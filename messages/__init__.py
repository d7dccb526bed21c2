"""Wire schemas (msgspec Structs), codecs and Kafka header conventions. Imports msgspec only."""
