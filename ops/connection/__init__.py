"""The Kafka connection every command shares: flags, `TOKENMILL_*` env vars, TOML and client
properties files, turned into one `actors.kafka.connection.KafkaConnection`."""
