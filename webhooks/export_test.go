package webhooks

// SetBeforeInsert makes Store call f between its lookup and its insert.
func (h *Handler) SetBeforeInsert(f func(StoredEvent)) { h.beforeInsert = f }
