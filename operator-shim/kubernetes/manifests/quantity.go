package manifests

import (
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
)

func reflectTypeOf(v any) reflect.Type { return reflect.TypeOf(v) }

func mustQ(s string) resource.Quantity { return resource.MustParse(s) }

var typeOfString = reflectTypeOf("")
