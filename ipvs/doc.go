// Package ipvs is the IPVS backend (virtual and real servers over generic
// netlink, helper rules as nft sets). It is built in a later milestone.
package ipvs
