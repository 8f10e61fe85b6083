package kubernetes

import "context"

func (c *Controller) bridgeNodes(ctx context.Context) { <-ctx.Done() }
func (c *Controller) bridgeTeams(ctx context.Context) { <-ctx.Done() }
