# Sourced by bench/ingest.sh and bench/meters.sh: the per-model catalog of
# the meter benchmarks. Every benchmark event is of gpt-4o with 1,200 input
# tokens, METERS_CACHE_READ (800) of them read from the cache, and 350
# output tokens; with the catalog, each event feeds three meters — m_input
# (400 tokens), m_cache (800) and m_output (350) — and the two default
# meters none of it.
METERS_MODEL=${METERS_MODEL:-gpt-4o}
METERS_CACHE_READ=${METERS_CACHE_READ:-800}

# create_meters DATABASE_URL: the three meters, through `overage meter create`.
create_meters() {
  local url=$1
  DATABASE_URL="$url" ./bin/overage meter create --key m_input --event-name m_input_tokens --token-type input --models "$METERS_MODEL" >/dev/null
  DATABASE_URL="$url" ./bin/overage meter create --key m_cache --event-name m_cache_read_tokens --token-type cache_read --models "$METERS_MODEL" >/dev/null
  DATABASE_URL="$url" ./bin/overage meter create --key m_output --event-name m_output_tokens --token-type output --models "$METERS_MODEL" >/dev/null
}

# event_flags: the ingestload/e2e flags of the meter benchmarks' events.
event_flags() { echo "-model $METERS_MODEL -cache-read $METERS_CACHE_READ"; }
