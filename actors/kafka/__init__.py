"""How every Kafka client of tokenmill connects: one connection setting (addresses, TLS, SASL),
the OAUTHBEARER token sources, and the errors that no retry can mend."""
