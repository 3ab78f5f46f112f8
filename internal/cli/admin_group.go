package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/tenure-dev/tenure/internal/fence"
)

// groupDelete is `tenure admin group delete`: it deletes a consumer group
// after moving its incarnation on.
//
// Deleting a group restarts its epochs at 1. Workers detect that on their
// own (docs/fencing.md, "Group lifetimes"); bumping first means the next
// lifetime starts in a new incarnation without having to detect anything,
// and the bump is recorded with who asked for it. Kafka deletes only an
// empty group, so the members are checked first: the bump is made only for a
// group that can be deleted. A bump never lets anyone in, so one made for a
// delete that then fails costs nothing.
type groupDelete struct {
	admin
	group, actor string
}

func (c *groupDelete) define(f *flagSet) {
	c.withDB(f)
	f.String(&c.group, "group", "", "consumer group to delete", arg("G"), required)
	c.withKafka(f, "Kafka seed brokers", required)
	c.actorFlag(f, &c.actor)
}

func (c *groupDelete) check([]string) error {
	if err := validGroup("group", c.group); err != nil {
		return err
	}
	return checkActor(c.actor)
}

func (c *groupDelete) run(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	adm := kadm.NewClient(cl)
	members, found, err := groupMembers(ctx, adm, c.group)
	if err != nil {
		return c.kafkaError("describing the group", err)
	}
	if !found {
		return fmt.Errorf("group %s does not exist on the brokers; nothing was changed", printableString(c.group))
	}
	if members > 0 {
		return fmt.Errorf("group %s has %s: Kafka deletes only an empty group; stop its workers first (a stopped or frozen one leaves when its session times out); nothing was changed",
			printableString(c.group), plural(members, "member"))
	}

	store, err := c.Store()
	if err != nil {
		return err
	}
	from, err := store.Incarnation(ctx, c.group)
	if err != nil {
		return c.dbError("reading the group's incarnation", err)
	}
	now, _, err := fence.Of(store).BumpIncarnation(ctx, c.group, from, c.actor, "tenure admin group delete: the group is deleted, its epochs restart")
	if err != nil {
		return c.dbError("bumping the group's incarnation", err)
	}
	resp, err := adm.DeleteGroup(ctx, c.group)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		if errors.Is(err, kerr.NonEmptyGroup) {
			return fmt.Errorf("group %s gained a member before it could be deleted; its incarnation moved from %d to %d (harmless: it only orders tokens); nothing else was changed",
				printableString(c.group), from, now)
		}
		return c.kafkaError(fmt.Sprintf("deleting the group (its incarnation moved from %d to %d, which is harmless)", from, now), err)
	}
	fmt.Fprintf(c.stdout, "deleted group %s; its incarnation moved from %d to %d, recorded as done by %s: tokens of the next workers (%d.1, ...) are above every token of the old group\n",
		printableString(c.group), from, now, c.actor, now)
	return nil
}

// groupMembers counts a group's members, classic or KIP-848.
func groupMembers(ctx context.Context, adm *kadm.Client, group string) (members int, found bool, err error) {
	lg, err := adm.ListGroups(ctx)
	if err != nil {
		return 0, false, err
	}
	if _, ok := lg[group]; !ok {
		return 0, false, nil
	}
	dg, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return 0, false, err
	}
	if g, ok := dg[group]; ok && g.Err == nil && g.State != "Dead" && len(g.Members) > 0 {
		return len(g.Members), true, nil
	}
	if cg, err := adm.DescribeConsumerGroups(ctx, group); err == nil {
		if g, ok := cg[group]; ok && g.Err == nil {
			return len(g.Members), true, nil
		}
	}
	return 0, true, nil
}
